"""jaxopt-marl: small LLMs as cooperative multi-agent policies over symbolic options, in JAX.

Submodules are imported explicitly (``from jaxopt_marl import guards``); this file stays minimal so that
importing one stage never pulls in another.
"""
