// placeholder until the hardware probe lands
