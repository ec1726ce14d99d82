"""``python -m experiments.overcooked --layout aa|fc``: PA-MAGRPO on Overcooked-AI (paper §5-§6).

Asymmetric Advantages (``aa``) or Forced Coordination (``fc``), 2 agents, 400-step episodes in the paper preset.
burn-in -> guards -> per-agent LoRA training -> evaluation on seeds 10000.. (trained adapters and the frozen base)
-> report, into ``runs/<name>/`` (presets: :mod:`jaxopt_marl.config`; flags: :mod:`experiments.common`; the run directory: :mod:`jaxopt_marl.pipeline`).
Default without an accelerator: ``--preset cpu`` (a reduced budget, said so in the output).
"""

from experiments.common import cli

if __name__ == "__main__":
    cli(None, prog="python -m experiments.overcooked")
