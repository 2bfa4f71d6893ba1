"""The flat layout's module paths before the sub-packages (README, "Changelog").

Each file here is found as ``flowgrpo.<old name>`` (the package adds this folder to its
``__path__``) and replaces itself with the module it became, warning once with the new path, so a
plug-in written against an old path keeps working. Real modules rather than an import hook or
placeholders: importing flowgrpo leaves ``sys.meta_path`` and ``sys.modules`` as they were."""
