// Local process launcher (filled in).
