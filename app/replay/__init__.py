"""Offline: ``kernelstream replay`` reads recorded topics (:mod:`.command`), analyses them
with the workers' own code (:mod:`.analysis`) and writes a report (:mod:`.report`,
:mod:`.plots`, :mod:`.whatif`)."""
