"""What a slow rank's time was spent on, beyond its own events: hardware samples, CPU
accounting and contention, the user's own frame."""
