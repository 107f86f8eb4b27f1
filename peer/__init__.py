"""hfl.peer"""
