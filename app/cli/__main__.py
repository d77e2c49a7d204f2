"""``python -m kernelstream.app.cli``: the same as the ``kernelstream`` command."""

from kernelstream.app.cli.main import main

main()
