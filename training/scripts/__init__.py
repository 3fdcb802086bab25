"""A user's own script as a run (``--strategy script``): the launcher that starts it under
torchrun and speaks the protocol for it (launch.py), the ranks' event files it reads (channel.py)
and the requests it passes to the ranks (control.py). No torch: the launcher only supervises.
"""
