"""Using a trained policy: enjoy.py (loading, video, matches against an opponent) and export."""
