"""Attention: argument checks, path choice, kernel call and fake implementation."""
