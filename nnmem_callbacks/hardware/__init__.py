"""What the hardware is: the GPU table, device capacity, and CUDA/cuDNN size tables (each number with its source)."""
