"""Model acquisition: turn a `--model` argument into a local directory that `mlx_lm.load` accepts."""
