"""The commands, one module each: ``hpctrain.commands.NAME`` holds ``build_parser()`` and
``run()`` of ``python -m hpctrain NAME`` (``compare-plans`` is ``compare_plans``). Shared flags
are in :mod:`hpctrain.commands.flags`; what every command that runs a network sets up first
(threads, backend, plan) is :mod:`hpctrain.commands.setup`."""
