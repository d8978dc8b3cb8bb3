"""Users' media decoded and checked: keyframe and guide images (images: EXIF, modes, bombs, the
canvas, the fit policy), reference audio and video (references: rotation, resampling,
finiteness, the 17n + 5 cut) and their decode budgets. Imports config only, no wire module."""
