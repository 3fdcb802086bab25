"""Studies: a grid of runs launched in one go (a base config times axes), and their answer per
cell: time to a target accuracy, final accuracy over seeds, speedup and efficiency."""
