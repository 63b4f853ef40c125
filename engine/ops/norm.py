"""(operators to be added)"""
