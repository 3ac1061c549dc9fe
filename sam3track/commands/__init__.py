"""The subcommands of the ``sam3track`` command line (parsed in :mod:`sam3track.cli`); each module adds
its own arguments (``add_parser``) and runs the command (``cmd_<name>``).

- :mod:`.track`: ``sam3track track``, one video into a mask video, JSON and PNGs (the job itself is
  :mod:`sam3track.jobs.track`);
- :mod:`.batch`: ``sam3track batch``, many videos on Ray (:mod:`sam3track.batch`);
- :mod:`.demo`: ``sam3track demo``, ``track`` on the bundled clip with the demo bundle;
- :mod:`.info`: ``sam3track info``, a bundle's manifest in brief;
- :mod:`.serve`: ``sam3track serve``, a local web page and JSON API (:mod:`sam3track.serve`);
- :mod:`.common`: exit codes, argument types and how user errors are reported.
"""
