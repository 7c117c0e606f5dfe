"""The one exception type mtrain raises for problems a user can fix.

Its message names the file, line or config key at fault and says what to do; the CLI
prints it on one line and exits with status 2 instead of showing a traceback.
"""


class MtrainError(Exception):
    """A user-facing error: bad input, bad config, missing files."""
