"""FFT convolution: argument checks, path choice, the kernel ops and the torch.fft reference."""
