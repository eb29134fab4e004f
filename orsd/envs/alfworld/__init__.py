"""ALFWorld on its real PDDL engine with problems generated offline: the env (env.py), the engine
wrapper (engine.py), the problem generator (generator.py) and the scene tables (scenes.py)."""

from orsd.envs.alfworld.env import AlfworldEnv

__all__ = ["AlfworldEnv"]
