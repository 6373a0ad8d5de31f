"""The NVIDIA vGPU driver simulator: state model, directory-tree frontend and FUSE frontend."""
