// placeholder, replaced as the core library lands
