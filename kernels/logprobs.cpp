// Filled in by the kernels work.
