"""Exit codes of a job, and of the ``sam3track`` command that runs it."""

EXIT_OK = 0
EXIT_ERROR = 2  # bad input: the message says what and where
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a Ctrl-C'd program
