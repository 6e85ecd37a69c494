"""The one error for bad user input (a flag, a value, a path): every verb raises UserError,
and bench.commands.common.run_verb turns it into one line on stderr and exit code 2."""


class UserError(ValueError):
    """Bad input from the user; the message is one line naming what was wrong."""
