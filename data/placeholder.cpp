// placeholder, replaced as the data library lands
