"""Push providers behind one port: ``fake``, ``apns``, ``fcm``, ``webhook``.

Each provider turns one send into exactly one :class:`~.port.Outcome`; provider
answers are translated there and nowhere else.
"""
