"""The errors the package raises for bad input: each message names the file, line or field at fault."""


class VQAError(Exception):
    """Base class: a problem with the user's input, configuration or files (not a bug in vqa)."""


class ConfigError(VQAError, ValueError):
    """Options or a configuration that cannot work: a missing argument, a bad value, options that cannot work
    together (the command line's usage error, exit status 2)."""


class InputError(VQAError, ValueError):
    """A bad or missing image, prompt or question given to the model or the predictor (exit status 1)."""


class DataError(VQAError, ValueError):
    """A data set file that is missing, malformed or inconsistent."""


class CheckpointError(VQAError, ValueError):
    """A checkpoint folder that is missing files or does not fit the code or config."""


class ExtraMissing(VQAError, ImportError):
    """A feature whose packages are an optional extra that is not installed: names the extra to install."""

    def __init__(self, what: str, extra: str, module: str | None = None):
        missing = f" ({module} is not installed)" if module else ""
        super().__init__(f"{what} needs the '{extra}' extra{missing}: pip install 'vqa[{extra}]'")
        self.extra = extra
