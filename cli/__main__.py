"""``python -m nscas.cli``: the ``nscas`` command, for programs that start it with the
interpreter they run in (the UI's verify button)."""

from nscas.cli.main import main

main()
