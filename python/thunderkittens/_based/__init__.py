"""Based linear attention: argument checks, path choice, the kernel op and the PyTorch reference."""
