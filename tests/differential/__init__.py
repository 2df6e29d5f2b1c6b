"""The property-based differential suite: random calls of every op, each checked against a
float64 PyTorch reference within the error PyTorch's own low-precision path makes.

Modules:
  settings     the hypothesis profiles (``cpu``: short, ``gpu``: long, ``smoke``), the fixed seed
  tolerance    the one tolerance rule every comparison applies
  environment  what the machine and the build can run, and the path each call should take
  layouts      operands in the memory layouts models produce (transposed, fused QKV slices,
               offset and strided slices, expanded views)
  attention    tk.attention cases: strategies, the float64 reference, PyTorch's yardstick, checks
  matmul       the same for tk.matmul
  based        the same for tk.based and tk.based_step
  fftconv      the same for tk.fftconv (and tk.FFTConv)
  standins     CPU stand-ins of the Based and FFT-conv kernel ops (the CPU profile's kernel paths)
  invalid      invalid calls (one argument broken) and the errors they must raise
  runner       the properties (hypothesis tests, sharded) and the per-path case counts; also
               runs one property by hand (``python -m differential``, also the way to run a
               sample under compute-sanitizer)
  worker       the case server: GPU jobs (property shards, fixed cases) in a long-lived process
               per test worker, a new one after a CUDA fault or a hang (it costs one job)
  fallback_layouts  the cases of test_fallback_layouts_gpu.py
  bad_input_cases   NaN/Inf and > 2^31-element checks of test_bad_input.py

The tests that use them: test_differential_cpu.py (short profile, CPU: fallbacks, validation,
the CPU stand-in kernels, fake tensors and torch.compile) and test_differential_gpu.py (long
profile in shards, the real kernels, every family forced in turn), test_fallback_layouts_gpu.py
and test_bad_input.py. TK_FUZZ_PROFILE picks the GPU suite's profile, TK_FUZZ_CPU_PROFILE the
CPU suite's, TK_FUZZ_SEED another seed, TK_FUZZ_SHRINK_S the time shrinking a failure may take.
"""
