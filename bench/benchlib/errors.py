"""The one exception type the bench scripts raise for problems a user can fix."""


class BenchError(Exception):
    """A failure with a message meant for the user; scripts print it and exit non-zero."""
