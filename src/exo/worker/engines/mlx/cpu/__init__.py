"""The Linux-CPU engine path: every place exo replaces or works around mlx and mlx-lm on a CPU, behind one setting.

mlx's CPU backend is slow where a GPU backend is not: half-precision and quantized matmuls run far from the BLAS,
element-wise kernels run one element at a time, and the wheel's BLAS is a reference one. So on a Linux CPU machine
(`machine.linux_cpu`) a runner, by default, uses:

- `float32`: the weights converted to float32 (dequantized first where quantized): only float32 reaches the BLAS;
- `numpy_attention`, `numpy_swiglu` (`kernels.py`): a long prefill's attention softmax and SwiGLU gate in numpy,
  re-pointed into mlx-lm's model modules;
- `matmul_plan` (`matmul_plan.py`, `matmul_planner.py`, `forward_pass_probe.py`): decoding's few-row products in
  the layout this machine's BLAS measured fastest, checked in whole forward passes;
- `blas_preload` (`blas.py`, checked by `blas_check.py`): an optimized BLAS preloaded into the runner;
- `decode_graph` (`decode_graph.py`, its ops in `ggml_graph_ops.py`): with ggml-held weights (`q8_0`, `gguf`), each
  decode step of a qwen2/llama model (one token for each sequence) as one ggml graph, as llama.cpp runs a step;
- `layer_graph` (`layer_graph.py`): with those weights, each decoder layer's pass over several tokens (a prefill
  piece, a draft's verification, a group prefill) as one ggml graph, attention included.

`--cpu-kernels off` turns all of them off (stock mlx-lm); `auto` (the default) turns them on for a Linux CPU only
(`switch.py`). Each replaced function is checked against the signature it was written for when `signatures.py` is
imported; a mismatch turns that replacement off with a warning. Only `engine.py` and below import mlx: `machine.py`,
`switch.py` and `blas.py` are used by the node process, which never loads mlx.
"""
