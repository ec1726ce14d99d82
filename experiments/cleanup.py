"""``python -m experiments.cleanup``: PA-MAGRPO on Melting Pot Cleanup (clean_up, 7 agents, 150-step episodes) (paper §5-§6).

burn-in -> guards -> per-agent LoRA training -> evaluation on seeds 10000.. (trained adapters and the frozen base)
-> report, into ``runs/<name>/`` (presets: :mod:`jaxopt_marl.config`; flags: :mod:`experiments.common`; the run directory: :mod:`jaxopt_marl.pipeline`).
Default without an accelerator: ``--preset cpu`` (a reduced budget, said so in the output).
"""

from experiments.common import cli

if __name__ == "__main__":
    cli("cleanup", prog="python -m experiments.cleanup")
