"""R2D2 (--algo r2d2): a recurrent Q-network on replayed sequences after a burn-in (learning.py). Its spec (spec.py)
is all the engine knows of it."""
