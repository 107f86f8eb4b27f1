"""hfl.launch"""
