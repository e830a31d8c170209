"""The ``podcost`` commands, one module each; ``podcost.cli`` registers them on its app."""
