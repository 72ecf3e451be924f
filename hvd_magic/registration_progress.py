"""The one-line progress of engines registering, for %hvd_start, %hvd_restart and %hvd_scale:
updated in place in a notebook, printed otherwise."""


class RegistrationProgress:
    """Registration progress: one line updated in place in a notebook, printed otherwise."""

    def __init__(self, shell):
        self.in_kernel = getattr(shell, "kernel", None) is not None
        self.handle = None
        self.last = None

    def __call__(self, registered: int, n: int) -> None:
        if (registered, n) == self.last:
            return
        self.last = (registered, n)
        text = {"text/plain": f"hvd: {registered}/{n} engines registered"}
        if not self.in_kernel:
            print(text["text/plain"])
            return
        from IPython.display import display
        if self.handle is None:
            self.handle = display(text, raw=True, display_id=True)
        else:
            self.handle.update(text, raw=True)
