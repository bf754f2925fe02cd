"""vfioctl — thin click commands: parse, call a library function, print. No logic here."""
