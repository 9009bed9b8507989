"""``python -m kvsim`` runs the command-line interface."""

from kvsim.cli import main

if __name__ == "__main__":  # pragma: no cover
    main()
