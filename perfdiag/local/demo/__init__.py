"""The bundled demo: a DDP training script (`train.py`) and the fault scenarios it can inject,
with what perfdiag should conclude for each (`scenarios.py`); the training parts it shares with
perfdiag's test and benchmark jobs (`ddp.py`)."""
