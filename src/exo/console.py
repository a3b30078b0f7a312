"""The `exo` console script's entry point, which imports nothing until it runs.

A runner is a spawned process, and spawning runs the parent's script again in the child (multiprocessing's
`__mp_main__`): whatever the script imports at its top, every runner imports too. With `exo.main` there, each runner
held the API server, the cluster and its TLS modules (uvicorn, zenoh, cryptography: 130 modules, 16 MiB) it never
uses.
"""


def main() -> None:
    from exo.main import main as run_exo

    run_exo()
