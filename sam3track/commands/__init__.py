"""The subcommands of the ``sam3track`` command line (parsed in :mod:`sam3track.cli`).

- :mod:`.track`: ``sam3track track``, tracking text prompts through a video into the outputs;
- :mod:`.demo`: ``sam3track demo``, ``track`` on the bundled clip with the demo bundle;
- :mod:`.info`: ``sam3track info``, a bundle's manifest in brief;
- :mod:`.outputs`: checking output paths before a run and closing the outputs after it;
- :mod:`.interrupts`: Ctrl-C handling that keeps the outputs consistent;
- :mod:`.common`: exit codes and how user errors are reported.
"""
