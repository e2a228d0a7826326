"""Projects: cwd → project root → settings, resolved once and shared by every subsystem.

:class:`ProjectRegistry` maps a working directory to its :class:`Project` (cached; dropped when a
``.git`` appears or vanishes on the way up, so the next lookup re-resolves); the settings are
read through the :class:`~qwenctxd.config.ConfigStore` each time, so an edited or moved
``<root>/.qwen/settings.json`` is seen as soon as the config store has reloaded it.
"""

from qwenctxd.project.registry import Project, ProjectRegistry
from qwenctxd.project.roots import find_project_root, home_dir, qwen_home

__all__ = ["Project", "ProjectRegistry", "find_project_root", "home_dir", "qwen_home"]
