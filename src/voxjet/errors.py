"""The one exception type that the CLI turns into a clear message and a non-zero exit."""


class VoxjetError(Exception):
    """A problem with the user's input: the message names the file or key and the fix."""
