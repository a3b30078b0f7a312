"""Pipeline parallel on mlx.distributed: one model's layers split over the ranks of a ring, one runner per rank.

`layer_split` cuts a model down to one rank's layers, `ring` joins the ranks, `lockstep` is what they do together
each step, `task_channel` is how rank 0 hands each task to the others, `follower` is what a rank other than 0 does
with a task.
"""
