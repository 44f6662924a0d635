"""``python -m cubelake.cli``."""

from . import main

main()
