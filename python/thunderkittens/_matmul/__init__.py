"""Matmul: argument checks, path choice, kernel call, fake implementation and autograd."""
