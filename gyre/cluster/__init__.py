"""Ray role groups, placement on devices, weight transfer and time-sharing of colocated roles."""
