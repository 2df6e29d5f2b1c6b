"""Attention: api (the public functions), checks (arguments), plan (kernel families, path
choice, explain), ops (op handles, fake implementations, autograd formula)."""
