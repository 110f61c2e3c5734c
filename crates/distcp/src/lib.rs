//! Read and write torch.distributed.checkpoint (DCP) directories, torch 2.0 to 2.15, with resharding reads.
