"""The ``kernelstream`` command line (:mod:`.main`) and the commands that are whole programs
of their own: the demo (:mod:`.demo`) and the topic follower (:mod:`.watch`)."""

from kernelstream.app.cli.main import main

__all__ = ["main"]
