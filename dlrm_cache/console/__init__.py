"""What a person reads: the console's lines and progress (:mod:`.say`), numbers written for people
(:mod:`.readable`) and settings written back to be typed (:mod:`.typed`).

Imports nothing of the package (a bottom layer): any command may talk to its user.
"""
