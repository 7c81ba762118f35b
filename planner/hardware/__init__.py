"""The hardware: accelerator and rack catalogs with their sources, and the cluster graph of each rack."""
