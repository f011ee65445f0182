// placeholder, replaced as the parallel library lands
