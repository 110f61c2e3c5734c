//! Read and write PyTorch-BigGraph HDF5 checkpoints (FileCheckpointStorage), with its commit protocol.
