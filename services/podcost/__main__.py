"""``python -m podcost``: the same command line as the ``podcost`` entry point."""

from podcost.cli import main

main()
