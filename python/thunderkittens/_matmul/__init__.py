"""Matmul: api (the public functions), checks (arguments), plan (kernel family, path choice,
explain), layout (the operands' shapes and layouts), ops (op handle, fake implementation,
autograd formula)."""
